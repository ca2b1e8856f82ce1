//! The Lua scripts, and how they are sent. The sources are the `.lua` files
//! beside this one (`src/wire/lua/`), included at compile time; the benches
//! include the same files, so no copy of a script exists anywhere else.
//!
//! Without fencing the acquire is not a script but a plain `SET key value NX
//! PX ttl` (`wire::commands`): a script costs the server several times the
//! CPU of the command it wraps. With fencing it is the [`ACQUIRE`] script,
//! chosen over a `MULTI`/`EXEC` transaction of the same commands by
//! measurement (DESIGN.md, section 2, step 4): the transaction costs the
//! server less (on Redis 7.0.15, 200,000 pipelined acquires on distinct
//! keys: `SET NX PX` 3.0–3.9 µs of server CPU each, `MULTI`, `SET`, `INCR`,
//! `EXEC` 5.8–6.4 µs, the script 10.4–11.1 µs) but the client more (its four
//! replies against one: callgrind counts 35 % more client instructions per
//! 5-node cycle), and it cannot seed an absent fence without a command more
//! on every acquire. Release, extend and the token write-back must compare
//! before acting, atomically, so they are scripts. Keys always travel in `KEYS[]` and
//! values in `ARGV[]`; nothing is spliced into script text, so the scripts
//! are constants and their SHA1 is computed once per process.
//!
//! Sending: every connection loads the lock's scripts ([`lock_scripts`]) in
//! its handshake, in the same round trip as its `INFO` and `ROLE`, so a
//! fresh or restarted server has them before the first `EVALSHA`. A server
//! whose cache was flushed since answers `NOSCRIPT`; we then send `EVAL`
//! with the source, which runs the script *and* caches it: one extra round
//! trip (redis-rs's `Script` would send `SCRIPT LOAD` and then `EVALSHA`:
//! two). The acquire's `EVAL` is not sent once its round has decided
//! ([`Script::eval_when_decided`]): the release may already be queued
//! behind it, and an acquire landing after its own release would leave a
//! key nobody releases for a whole TTL; a `SCRIPT LOAD` goes instead, so
//! that a node always the last to answer still gets the script.

use std::sync::LazyLock;

use redis::Cmd;

/// A Lua script with its SHA1, computed once.
#[derive(Debug)]
pub(crate) struct Script {
    /// What a permission error calls it ("the acquire script").
    pub(crate) name: &'static str,
    source: &'static str,
    sha: String,
    /// Whether the `EVAL` after a `NOSCRIPT` goes out even when the round
    /// has decided: yes for scripts that act only on our own unique value
    /// or only raise fences (a late run leaves nothing behind), no for the
    /// acquire (a late grant would outlive its release).
    pub(crate) eval_when_decided: bool,
}

impl Script {
    pub(crate) fn new(name: &'static str, source: &'static str) -> Self {
        let sha = redis::Script::new(source).get_hash().to_owned();
        Self {
            name,
            source,
            sha,
            eval_when_decided: true,
        }
    }

    /// The commands the script runs, as ACL names (`SET`, `PUBSUB|NUMSUB`),
    /// in order of first use: read from its source, so that they cannot
    /// drift from what it runs.
    pub(crate) fn commands(&self) -> Vec<String> {
        let mut commands: Vec<String> = Vec::new();
        for call in self.source.split("redis.call(").skip(1) {
            let mut words = call.split(',').map(str::trim);
            let quoted = |w: Option<&str>| {
                w.and_then(|w| w.strip_prefix('\'')?.strip_suffix('\''))
                    .map(str::to_owned)
            };
            let Some(mut command) = quoted(words.next()) else {
                continue;
            };
            // A quoted second word is a subcommand (`PUBSUB NUMSUB`); a
            // key or argument is never quoted in our scripts.
            if let Some(sub) =
                quoted(words.next()).filter(|w| w.chars().all(|c| c.is_ascii_uppercase()))
            {
                if command == "PUBSUB" {
                    command = format!("{command}|{sub}");
                }
            }
            if !commands.contains(&command) {
                commands.push(command);
            }
        }
        commands
    }

    /// `SCRIPT LOAD source`, for a connection's handshake.
    pub(crate) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }

    /// `EVALSHA sha numkeys keys… args…`
    pub(crate) fn evalsha(&self, keys: &[&str], args: &[&[u8]]) -> Cmd {
        self.build("EVALSHA", &self.sha, keys, args)
    }

    /// `EVALSHA sha numkeys keys…`, sized for `more` bytes of arguments
    /// that the caller appends (`Cmd::arg`: numbers go in without a
    /// `String` in between).
    pub(crate) fn evalsha_keys(&self, keys: &[&str], more: usize) -> Cmd {
        let bytes = self.sha.len() + 12 + keys.iter().map(|k| k.len()).sum::<usize>() + more;
        let mut cmd = Cmd::with_capacity(8, bytes);
        cmd.arg("EVALSHA").arg(&self.sha).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        cmd
    }

    /// The same script on sharded pub/sub. Made twice per process at most
    /// (two statics), so its source is leaked rather than owned.
    fn sharded(&self) -> Script {
        let source = self
            .source
            .replace("'PUBLISH'", "'SPUBLISH'")
            .replace("'NUMSUB'", "'SHARDNUMSUB'");
        Script {
            eval_when_decided: self.eval_when_decided,
            ..Script::new(self.name, Box::leak(source.into_boxed_str()))
        }
    }

    /// `evalsha`, an `EVALSHA` of another script, as this script's: the
    /// same keys and arguments under this script's SHA1.
    pub(crate) fn evalsha_of(&self, evalsha: &Cmd) -> Cmd {
        let args = evalsha.args_iter();
        let mut cmd = Cmd::with_capacity(args.len(), 128);
        cmd.arg("EVALSHA").arg(&self.sha);
        for arg in args.skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }

    /// `EVAL source numkeys keys… args…`, the fallback after `NOSCRIPT`.
    pub(crate) fn eval(&self, keys: &[&str], args: &[&[u8]]) -> Cmd {
        self.build("EVAL", self.source, keys, args)
    }

    /// The `EVAL` of a prepared `EVALSHA` of this script: the same keys and
    /// arguments, the fallback after `NOSCRIPT`.
    pub(crate) fn eval_of(&self, evalsha: &Cmd) -> Cmd {
        let args = evalsha.args_iter();
        let mut cmd = Cmd::with_capacity(args.len(), self.source.len() + 64);
        cmd.arg("EVAL").arg(self.source);
        for arg in args.skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }

    fn build(&self, verb: &str, body: &str, keys: &[&str], args: &[&[u8]]) -> Cmd {
        // Sized up front: growing the buffers argument by argument cost a
        // few reallocations per call, on every node of every release.
        let bytes = verb.len()
            + body.len()
            + 4
            + keys.iter().map(|k| k.len()).sum::<usize>()
            + args.iter().map(|a| a.len()).sum::<usize>();
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), bytes);
        cmd.arg(verb).arg(body).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        for a in args {
            cmd.arg(*a);
        }
        cmd
    }

    /// Runs the script on any connection: `EVALSHA`, then `EVAL` after
    /// `NOSCRIPT`. For connections the caller owns (the fenced store); the
    /// lock's own nodes go through `Node::run_script`, which also checks the
    /// settled flag between the two.
    pub(crate) async fn invoke<C>(
        &self,
        conn: &mut C,
        keys: &[&str],
        args: &[&[u8]],
    ) -> redis::RedisResult<redis::Value>
    where
        C: redis::aio::ConnectionLike + Send,
    {
        match self.evalsha(keys, args).query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.eval(keys, args).query_async(conn).await
            }
            other => other,
        }
    }
}

/// The fenced acquire (DESIGN.md, section 6): `SET lock value NX PX ttl`,
/// then `INCR` of the fence of the resource's bucket, seeded when it was
/// absent or unseeded (`INCR` gave less than
/// [`SEEDED_FROM`](crate::logic::fence::SEEDED_FROM): `INCRBY` the
/// client's clock seed). A first attempt goes as a transaction on our own
/// connections instead (`wire::transacted`), and as this script
/// elsewhere, or to seed the fence the transaction could not. Returns the new fence when granted, `{fence}` when
/// refused, `{fence, PTTL}` when refused and asked for the holder's TTL (a
/// waiter's retry). A fence at 2^53 or beyond is an error reply: the script
/// sees numbers as doubles, exact below 2^53 (tokens reach it around the
/// year 2255), and a wrong token is worse than no vote. Asked to (a fifth
/// argument "1"), a key that already holds `value` counts as granted, with
/// a fresh TTL (`SET XX PX`): a fair waiter's pre-granted value on the home
/// node, asked for again (DESIGN.md, section 2, fair queue, step 3).
/// Given a sixth argument, a key whose value has that SHA1 counts as free:
/// the key of the holder whose release handed the lock over to this fair
/// waiter (the fair queue's step 3, "Handover"; the notice carries the
/// hash, never the value); it is replaced the same way.
/// Given a seventh argument (a client's tag, on the home node, with the
/// claim key as third key: a waiter outside the fair queue), a key that
/// the home's release reserved for that client (`{tag}:o:…`) counts as
/// free, and a refusal claims the next turn: the claim key is set to
/// `{tag}:{eighth argument}` (how long the reservation is to wait for
/// the client, ms) for the holder's remaining TTL plus that, unless
/// another client claimed first; a grant deletes the client's own claim
/// (DESIGN.md, section 2, fair queue, "Outside turns").
///
/// KEYS: lock key, fence key[, claim key]. ARGV: value, ttl ms, seed[,
/// "1" to probe or ""[, "1" to take our own key or ""[, the SHA1 of the
/// value handed over or ""[, the claiming client's tag, the reservation's
/// life ms]]]].
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script {
    eval_when_decided: false,
    ..Script::new("acquire", include_str!("lua/acquire.lua"))
});

/// The all-or-nothing acquire of several resources (`multi`; DESIGN.md,
/// section 6c), generic over N keys: every lock key is looked at first
/// (`PTTL`), and if any is held nothing is written on this node and the
/// reply names it (`{i}`, or `{i, PTTL}` when probed); otherwise every
/// key is set to `value` with the TTL and every fence moves as the
/// mutex's acquire moves it (`INCR`, seeded from the clock when absent),
/// replying `{0, fence…}`. A fence that would reach 2^53 is an error reply
/// before anything is set. The keys are the mutex's own (same names, same
/// value format), so release, extend, inspect and `force_release` of each
/// resource are the mutex's. Fences move only on a grant: a refusal
/// writes nothing at all.
///
/// KEYS: n lock keys[, their n fence keys]. ARGV: value, ttl ms, seed, n,
/// "1" to probe or "".
pub(crate) static ACQUIRE_ALL: LazyLock<Script> = LazyLock::new(|| Script {
    eval_when_decided: false,
    ..Script::new("acquire-all", include_str!("lua/acquire_all.lua"))
});

/// The release of a whole multi-resource set on one node (DESIGN.md,
/// section 6c): per resource, compare-and-delete of its lock key and,
/// where its waiting marker is there and clients listen, the notice
/// `release.lua` publishes (`{notice}:{listeners}` on its channel). On a
/// resource's home node, when it is waited for and fair waiters listen
/// (`NUMSUB` of `{channel}/q`), that resource is left alone (-1) and the
/// client sends it the full [`RELEASE`], which names the queue's next
/// waiter, as the lean release asks for the full one. Replies one code per
/// resource: 1 deleted, 0 not ours (nothing deleted), -1 left for the full
/// release.
///
/// KEYS: per resource, lock key and waiting marker. ARGV: value, then per
/// resource: notice id, notice channel, "1" on its home or "".
pub(crate) static RELEASE_ALL: LazyLock<Script> =
    LazyLock::new(|| Script::new("release-all", include_str!("lua/release_all.lua")));

/// The extension of a whole multi-resource set on one node: every key
/// still ours extended together, or none (1; else -1 when a key holds
/// another owner's value, 0 when one is gone), so that an extension never
/// leaves a node holding part of the set. Never deletes.
///
/// KEYS: the set's lock keys. ARGV: value, ttl ms.
pub(crate) static EXTEND_ALL: LazyLock<Script> =
    LazyLock::new(|| Script::new("extend-all", include_str!("lua/extend_all.lua")));

/// [`RELEASE_ALL`] for a Redis Cluster node (sharded pub/sub); see
/// [`RELEASE_SHARDED`].
pub(crate) static RELEASE_ALL_SHARDED: LazyLock<Script> = LazyLock::new(|| RELEASE_ALL.sharded());

/// The release script for a Redis Cluster node: sharded pub/sub
/// (`SPUBLISH`, `PUBSUB SHARDNUMSUB`, Redis 7), so that a notice stays in
/// the shard of its lock key. Same keys and arguments as [`RELEASE`].
pub(crate) static RELEASE_SHARDED: LazyLock<Script> = LazyLock::new(|| RELEASE.sharded());

/// The fair queue's look for a Redis Cluster node; see [`RELEASE_SHARDED`].
pub(crate) static QUEUE_SHARDED: LazyLock<Script> = LazyLock::new(|| QUEUE.sharded());

/// The variant of `script` a Redis Cluster runs: itself, unless it
/// publishes.
pub(crate) fn on_cluster(script: &Script) -> &Script {
    if script.sha == RELEASE.sha {
        &RELEASE_SHARDED
    } else if script.sha == QUEUE.sha {
        &QUEUE_SHARDED
    } else if script.sha == RELEASE_ALL.sha {
        &RELEASE_ALL_SHARDED
    } else {
        script
    }
}

// The read-write lock's scripts (`rwlock`, DESIGN.md section 6b; their
// replies are parsed in `rwlock::scripts`).

/// A reader's admission: one `MGET` of the writer key, the waiting
/// writer's marker and the fence; refused while a writer holds or waits;
/// else sets this reader's entry (`SET PX`), adds its name to the index
/// (pruning the names whose keys are gone when asked: one read in 8) and
/// returns the fence as it stands (the generation seen; seeded
/// from the clock when absent or unseeded, below
/// [`SEEDED_FROM`](crate::logic::fence::SEEDED_FROM)), or 0 without fencing. Refused: `{0, PTTL
/// of what blocks}`.
///
/// KEYS: writer, readers, waiting, entry[, fence]. ARGV: value, ttl ms,
/// seed, "1" to prune or "".
/// Its `EVAL` after `NOSCRIPT` does not go out once its round decided
/// (as the acquire's).
pub(crate) static RW_READ: LazyLock<Script> = LazyLock::new(|| Script {
    eval_when_decided: false,
    ..Script::new("rw-read", include_str!("lua/rw_read.lua"))
});

/// A writer's admission: refused while a writer or any live reader holds
/// (and then, given a marker id, sets the waiting marker unless another
/// writer's is there); else `SET PX` of the writer key, deletes its own
/// marker, and `INCR`s the fence as the mutex's acquire does (seeded when
/// absent). Returns the new fence (0 without fencing), `{0, PTTL}` when
/// refused (the longest reader's, or the writer's).
///
/// KEYS: writer, readers, waiting[, fence]. ARGV: value, ttl ms, seed,
/// marker id or "", marker life ms.
/// Its `EVAL` after `NOSCRIPT` does not go out once its round decided.
pub(crate) static RW_WRITE: LazyLock<Script> = LazyLock::new(|| Script {
    eval_when_decided: false,
    ..Script::new("rw-write", include_str!("lua/rw_write.lua"))
});

/// The downgrade: where the writer key holds our value, deletes it and
/// sets a reader entry with the same value in the same script. 1 when
/// converted, 0 when the writer key is not ours there.
///
/// KEYS: writer, readers, entry. ARGV: value, ttl ms.
pub(crate) static RW_DOWNGRADE: LazyLock<Script> =
    LazyLock::new(|| Script::new("rw-downgrade", include_str!("lua/rw_downgrade.lua")));

/// The inspection, read-only (`GET`, `PTTL`, `SMEMBERS`): the writer
/// key, the waiting writer's marker, the fence, the size of the readers'
/// index and up to ARGV[1] live reader entries; dead names are skipped,
/// not pruned.
///
/// KEYS: writer, readers, waiting[, fence]. ARGV: the most entries.
/// Reply: `{writer, its PTTL, marker, its PTTL, fence, names, {value,
/// PTTL, …}}`, nil for what is absent.
pub(crate) static RW_INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new("rw-inspect", include_str!("lua/rw_inspect.lua")));

/// The scripts a cluster's masters load beside [`lock_scripts`].
pub(crate) fn sharded_scripts() -> [&'static Script; 3] {
    [&RELEASE_SHARDED, &QUEUE_SHARDED, &RELEASE_ALL_SHARDED]
}

/// Every script of the crate: the lock's and the fenced store's.
fn all_scripts() -> [&'static Script; 20] {
    [
        &ACQUIRE,
        &SEED,
        &ACQUIRE_ALL,
        &RELEASE,
        &RELEASE_LEAN,
        &RELEASE_ALL,
        &EXTEND_ALL,
        &QUEUE,
        &JOIN,
        &MARK,
        &LEAVE,
        &EXTEND,
        &WRITE_BACK,
        &RESEED,
        &FENCED_WRITE,
        &FENCED_READ,
        &RW_READ,
        &RW_WRITE,
        &RW_DOWNGRADE,
        &RW_INSPECT,
    ]
}

/// The script of ours whose SHA1 `message` names (Redis names the script
/// in errors raised inside it).
pub(crate) fn named_in(message: &str) -> Option<&'static Script> {
    all_scripts()
        .into_iter()
        .find(|script| message.contains(script.sha.as_str()))
}

/// The scripts a lock's node runs, loaded by every connection's handshake:
/// the mutex's (and the multi-resource acquire, release and extend) and
/// the read-write lock's admissions and downgrade (not its operators'
/// inspection: its first use pays one `NOSCRIPT` and an `EVAL`).
pub(crate) fn lock_scripts() -> [&'static Script; 17] {
    [
        &ACQUIRE,
        &SEED,
        &ACQUIRE_ALL,
        &RELEASE,
        &RELEASE_LEAN,
        &RELEASE_ALL,
        &EXTEND_ALL,
        &MARK,
        &EXTEND,
        &WRITE_BACK,
        &RESEED,
        &QUEUE,
        &JOIN,
        &LEAVE,
        &RW_READ,
        &RW_WRITE,
        &RW_DOWNGRADE,
    ]
}

/// Delete the key only if it still holds our value, and announce it to the
/// clients waiting for it (`notify`): a `PUBLISH` on the key's notice
/// channel (`{key}@{db}`, `resource::notice_channel`), carrying the
/// acquisition's public notice id (never the value, which authorises
/// release) and how many clients are subscribed, so each can spread its
/// retry over that many (`PUBSUB NUMSUB`; nothing is published when nobody
/// waits). On the resource's home node (the fair queue, `protocol::queue`)
/// it also takes the holder's own ticket out of the queue when it got the
/// lock from the queue, asks `NUMSUB` about the fair marker channel
/// (`{channel}/q`) in the same command, and when fair waiters listen reads
/// the queue's head (`LINDEX`: the ticket stays there until its own
/// holder's release takes it out, so a waiter joining meanwhile is not
/// alone in the queue) and publishes `{notice}:{listeners}:{ticket}` on the
/// channel of the ticket's client (`{channel}/{the ticket's tag}`, up to
/// its first `.`, or its first 8 characters for a client before issue 31;
/// `resource::fair_channels`): that waiter alone attempts next.
/// On the home node the head is named even when the key there
/// is not the holder's (its acquire never reached the home): the release
/// of a granted lock always goes to the home (`protocol::release`), so a
/// queue is never left waiting for a notice that no node would send.
/// With the fence key (a fenced client, a plain server as home), the
/// releasing connection's vouch (an eighth argument "1": this server
/// votes in fenced requests for the releaser, past its restart-guard
/// window and re-seeded; `Server::run_script_vouched`) and a ticket that
/// carries its TTL (`-{ms}`), the named ticket also gets the home's vote
/// when the key there is free and its client listens (or is the releasing
/// client): `SET NX PX` of `{tag}:{rest of the ticket}:{notice}`, the
/// fence's `INCR` (seeded from the releaser's clock when absent), and the
/// fence appended to the notice (the *pre-grant*).
/// A ticket of the releasing client (its tag in ARGV) is not published:
/// the reply names it. Asked to hand the lock over (a seventh argument
/// "1"), when the key was the holder's, the vote was pre-granted, nobody
/// listens on the plain channel (no client waits the classic way, which
/// needs the other nodes freed to compete) and the ticket says its client
/// can take a handover (`h-{ms}`), the notice also
/// carries the SHA1 of the holder's value (never the value: it proves
/// ownership, and pub/sub is readable by every client that may
/// subscribe) and how long its keys live at most (the ninth argument, in
/// ms): the named waiter's acquire replaces the keys holding a value of
/// that SHA1 on the other nodes (the *handover*: the holder leaves its
/// keys there to it; DESIGN.md, section 2, fair queue, step 3,
/// "Handover"). Elsewhere than the home, a fourth argument "sha1" says the
/// first is the SHA1 of the value to delete: the keys a handover left for
/// a waiter that will not take them.
/// With the claim key (a fourth key, with the fence key), when the key was
/// the holder's, fair waiters are queued and a client waiting outside the
/// queue claimed the next turn (`{tag}:{life ms}`, set by its refused
/// acquire, see [`ACQUIRE`]), the release reserves the home's vote for
/// that client instead (`SET NX PX` of `{tag}:o:{notice}` for the claim's
/// life, which that client's next acquire takes as free), deletes the
/// claim and names nobody (DESIGN.md, section 2, fair queue, "Outside
/// turns").
/// Returns 1 when deleted, 2 when deleted and a ticket named, 4 when
/// deleted, named and handed over, 5 when deleted and reserved for an
/// outside claim, 3 when a ticket was named without the holder's key
/// there, 0 when neither (elsewhere than the home: nothing announced);
/// `{code, ticket, fence or ""}` when the ticket named is the releasing
/// client's.
///
/// KEYS: lock key[, queue key on the home node[, fence key, claim key]].
/// ARGV: value
/// (or its SHA1), notice id, notice channel (pub/sub is server-wide, so
/// the channel names the database; a script cannot read its database
/// index, so the client passes the name)[, elsewhere: "sha1" or ""][, on
/// the home node: the holder's ticket or "", the clock seed or "", the
/// releasing client's tag, "1" to hand over or "", "1" when vouched or "",
/// the holder's keys' life in ms].
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new("release", include_str!("lua/release.lua")));

/// The home node's release in the common case (issue 32): the holder
/// came without a ticket, nothing is to be handed over, and this client
/// keeps no waiter of the resource. Compare-and-delete, as the non-home
/// nodes' release, unless the waiting marker is there: then it does
/// nothing and returns -1, and the client sends the full [`RELEASE`] (one
/// round trip more, only when somebody waits). Returns 1 when it deleted
/// our key, 0 when the key is not ours (absent, expired, another value).
/// Exactly `release.lua`'s answer for a holder without a ticket on a
/// resource nobody marked: that script returns at its `if not waited`
/// branch with the same codes after the same compare-and-delete.
///
/// KEYS: lock key, waiting marker. ARGV: value.
pub(crate) static RELEASE_LEAN: LazyLock<Script> =
    LazyLock::new(|| Script::new("release", include_str!("lua/release_lean.lua")));

/// The fair queue's look at the home node, for a waiter whose timer fired
/// (`protocol::queue`): skips a stale head
/// (the ticket the waiter saw at the head last time, if it is still there
/// and the lock key is absent: its owner did not take a free turn) and
/// every other ticket of its client (the first 8 characters of a ticket
/// name its client; a client whose head lets a free turn pass has most
/// likely died, and its other waiters put their tickets back at their next
/// look if not), puts
/// the waiter's ticket back at the back if it is missing (a queue emptied
/// by a restart is rebuilt by the waiters' looks), keeps the queue key alive
/// for the waiter's remaining wait when asked to (or when its `RPUSH`
/// created the key), and returns `{head ticket or nil, PTTL of the lock
/// key, the waiter's position (1 = head)}`. When the lock key is absent and
/// the head is another client's ticket, it tells that client so (`PUBLISH`
/// of `p:0:{ticket}` on its channel: the head's waiter attempts, still
/// queued): a head is skipped only after it was told it may go, never for
/// a turn it did not know of.
///
/// KEYS: lock key, queue key. ARGV: ticket, queue life ms, stale head or
/// "", the key's notice channel, "1" to keep the key alive or "".
pub(crate) static QUEUE: LazyLock<Script> =
    LazyLock::new(|| Script::new("queue", include_str!("lua/queue.lua")));

/// A fair waiter joining the queue (`protocol::queue::join`): `RPUSH` of
/// its ticket and, when that created the key or when asked (this client's
/// last `PEXPIRE` no longer covers the waiter), the key's `PEXPIRE`, in
/// one script. Two commands, as before issue 31, left a key created by
/// the `RPUSH` without any expiry when the client died (or its connection
/// broke) before the `PEXPIRE`: a queue key forever. Returns the list's
/// length and the lock key's `PTTL` (a waiter alone in the queue with the
/// lock free attempts at once; before issue 32 a list of one was taken
/// for a free lock, and a waiter whose attempt had just been refused
/// either attempted in vain or, when the release had in fact run before
/// its join, waited for its fallback pause).
///
/// KEYS: queue key, lock key. ARGV: ticket, queue life ms, "1" to keep
/// the key alive or "".
pub(crate) static JOIN: LazyLock<Script> =
    LazyLock::new(|| Script::new("join", include_str!("lua/join.lua")));

/// A waiter outside the fair queue (the classic competition, or a queue
/// widened when its home went silent) marks the resource as waited for
/// on every node (`protocol::queue::mark_waiting`): the waiting marker, a
/// string key whose life it extends to its own remaining wait. A release
/// publishes its notice only where the marker is (`release.lua`'s `MGET`).
///
/// KEYS: waiting marker. ARGV: life ms.
pub(crate) static MARK: LazyLock<Script> =
    LazyLock::new(|| Script::new("mark", include_str!("lua/mark.lua")));

/// A fair waiter leaving the queue (cancelled, or given up) on a home
/// that pre-grants: takes its ticket out (`LREM`) and, when the lock key
/// holds a pre-granted value of that ticket (the release named it before
/// the waiter left, or while its notice was on the way), deletes it and
/// tells the new head's client that the lock is free (`p:0:{ticket}`, as
/// the look does). Returns 1 when it deleted a pre-granted key.
///
/// KEYS: lock key, queue key. ARGV: ticket, the pre-granted value's prefix
/// (`{tag}:{rest of the ticket}:`), the key's notice channel.
pub(crate) static LEAVE: LazyLock<Script> =
    LazyLock::new(|| Script::new("leave", include_str!("lua/leave.lua")));

/// Reset the expiry only if the key still holds our value (fences never
/// expire, so nothing else needs keeping alive). Returns
/// 1 when extended, 0 when absent, -1 when another owner's value is there
/// (the watchdog treats that as the lock taken over where it was ours).
/// Never deletes: an extend that falls short leaves the lock to expire on
/// its old schedule.
///
/// KEYS: lock key. ARGV: value, ttl ms.
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new("extend", include_str!("lua/extend.lua")));

/// The write-back: raises the fence to the token chosen by the client,
/// only while the lock key still holds our value (so a token is never
/// stored by an attempt that lost the key to someone else, which keeps
/// tokens unique even when leases overlap). Returns 1 when the fence is now
/// ≥ the token, 0 when the key is gone or someone else's. Fences are
/// compared as decimal strings (length, then bytes: `INCR` writes them
/// without leading zeros), exact over the whole range.
///
/// KEYS: lock key, fence key. ARGV: value, token.
pub(crate) static WRITE_BACK: LazyLock<Script> =
    LazyLock::new(|| Script::new("write-back", include_str!("lua/write_back.lua")));

/// The restart guard's re-seed: raises each fence in `KEYS` to the value in
/// the same position of `ARGV` (the largest the other nodes read hold),
/// never lowers one. Same decimal-string comparison as the write-back.
/// Returns the number of keys.
///
/// KEYS: fence keys. ARGV: values.
pub(crate) static RESEED: LazyLock<Script> =
    LazyLock::new(|| Script::new("re-seed", include_str!("lua/reseed.lua")));

/// The seed of a fence an acquire's transaction left unseeded on a node
/// whose answer came after the round decided (`wire::transacted`): `INCR`,
/// and `INCRBY seed` below 2^40, as the acquire moves a fence; no lock key
/// is read or written, so it may run however late. Returns the fence.
///
/// KEYS: fence. ARGV: seed.
pub(crate) static SEED: LazyLock<Script> =
    LazyLock::new(|| Script::new("seed", include_str!("lua/seed.lua")));

/// The fenced store's write: store the value only if the token is at least
/// the largest the key has accepted. Tokens are compared as decimal strings
/// (length, then bytes), which is exact for every u64. Returns 1 when
/// written, `{0, current}` when refused.
///
/// KEYS: the store key (a hash of `value` and `fence`). ARGV: value, token.
pub(crate) static FENCED_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new("fenced-write", include_str!("lua/fenced_write.lua")));

/// The fenced store's read: `{value, fence}`, or nil for a key never
/// written.
pub(crate) static FENCED_READ: LazyLock<Script> =
    LazyLock::new(|| Script::new("fenced-read", include_str!("lua/fenced_read.lua")));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_put_keys_in_keys() {
        let cmd = RELEASE.evalsha(&["k"], &[b"v"]);
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[0], b"EVALSHA");
        assert_eq!(args[1], RELEASE.sha.as_bytes());
        assert_eq!(args[2], b"1");
        assert_eq!(args[3], b"k");
        assert_eq!(args[4], b"v");
        assert_eq!(RELEASE.sha.len(), 40);
        let eval: Vec<_> = RELEASE
            .eval(&["k"], &[])
            .args_iter()
            .count()
            .to_string()
            .into_bytes();
        assert_eq!(eval, b"4");
    }

    /// Every script that moves a fence seeds one below the floor, not
    /// only an absent one: a fenced acquire's transaction leaves a fence
    /// it found absent at 1 (`wire::transacted`), and `INCR` would take
    /// it on from there.
    #[test]
    fn every_script_that_moves_a_fence_seeds_below_the_floor() {
        let floor = format!("< {}", crate::logic::fence::SEEDED_FROM);
        for script in [
            &*ACQUIRE,
            &*SEED,
            &*ACQUIRE_ALL,
            &*RELEASE,
            &*RW_WRITE,
            &*RW_READ,
        ] {
            assert!(
                script.source.contains(&floor),
                "{}: no {floor}",
                script.name
            );
            assert!(!script.source.contains("f == 1"), "{}", script.name);
            assert!(
                script.commands().iter().any(|c| c == "INCRBY"),
                "{}",
                script.name
            );
        }
        for script in [&*WRITE_BACK, &*RESEED, &*EXTEND, &*EXTEND_ALL] {
            assert!(
                !script.source.contains("INCR"),
                "{} moves no fence",
                script.name
            );
        }
    }

    #[test]
    fn scripts_know_the_commands_they_run() {
        assert_eq!(
            ACQUIRE.commands(),
            ["SET", "GET", "LRANGE", "LREM", "RPUSH", "PTTL", "PEXPIRE", "INCR", "INCRBY"]
        );
        assert_eq!(
            RELEASE.commands(),
            [
                "MGET",
                "DEL",
                "SET",
                "PUBSUB|NUMSUB",
                "PUBLISH",
                "LREM",
                "LLEN",
                "LPOP",
                "LINDEX",
                "INCR",
                "INCRBY"
            ]
        );
        assert_eq!(
            QUEUE.commands(),
            ["PTTL", "LINDEX", "LRANGE", "LREM", "LPOS", "RPUSH", "PEXPIRE", "SET", "PUBLISH"]
        );
        assert_eq!(
            LEAVE.commands(),
            ["LREM", "GET", "DEL", "LINDEX", "PUBLISH"]
        );
        assert_eq!(
            ACQUIRE_ALL.commands(),
            ["PTTL", "GET", "SET", "INCR", "INCRBY"]
        );
        assert_eq!(
            RELEASE_ALL.commands(),
            ["MGET", "PUBSUB|NUMSUB", "DEL", "PUBLISH"]
        );
        assert_eq!(
            RELEASE_ALL_SHARDED.commands(),
            ["MGET", "PUBSUB|SHARDNUMSUB", "DEL", "SPUBLISH"]
        );
        assert!(std::ptr::eq(
            on_cluster(&RELEASE_ALL),
            &*RELEASE_ALL_SHARDED
        ));
        assert_eq!(EXTEND_ALL.commands(), ["GET", "PEXPIRE"]);
        assert_eq!(JOIN.commands(), ["RPUSH", "PEXPIRE", "PTTL", "SET"]);
        assert_eq!(MARK.commands(), ["GET", "PTTL", "SET", "DEL", "PEXPIRE"]);
        assert_eq!(EXTEND.commands(), ["GET", "PEXPIRE"]);
        assert_eq!(WRITE_BACK.commands(), ["GET", "SET"]);
        assert_eq!(SEED.commands(), ["INCR", "INCRBY"]);
        assert_eq!(RESEED.commands(), ["GET", "SET"]);
        assert_eq!(FENCED_WRITE.commands(), ["HGET", "HSET"]);
        assert_eq!(FENCED_READ.commands(), ["HMGET"]);
        assert_eq!(
            RW_READ.commands(),
            ["MGET", "PTTL", "SMEMBERS", "EXISTS", "DEL", "SREM", "SET", "SADD", "INCRBY"]
        );
        assert_eq!(
            RW_WRITE.commands(),
            ["GET", "SET", "PTTL", "SMEMBERS", "EXISTS", "DEL", "SREM", "INCR", "INCRBY"]
        );
        assert_eq!(RW_DOWNGRADE.commands(), ["GET", "DEL", "SET", "SADD"]);
        assert_eq!(RW_INSPECT.commands(), ["GET", "PTTL", "SMEMBERS"]);
        assert!(!RW_READ.eval_when_decided && !RW_WRITE.eval_when_decided);
        let message = format!("ERR The user executing the script can't run this command or subcommand script: {}, on @user_script:4.", ACQUIRE.sha);
        assert_eq!(named_in(&message).map(|s| s.name), Some("acquire"));
        assert!(named_in("ERR something else").is_none());
    }

    fn words(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn the_eval_of_a_prepared_evalsha_carries_its_keys_and_arguments() {
        let mut evalsha = ACQUIRE.evalsha_keys(&["lock", "fence"], 0);
        evalsha.arg("v").arg(10_000_u64).arg(42_u64);
        assert_eq!(
            words(&evalsha),
            words(&ACQUIRE.evalsha(&["lock", "fence"], &[b"v", b"10000", b"42"]))
        );
        let eval = words(&ACQUIRE.eval_of(&evalsha));
        assert_eq!(
            eval,
            words(&ACQUIRE.eval(&["lock", "fence"], &[b"v", b"10000", b"42"]))
        );
        assert_eq!(eval[0], b"EVAL");
        assert_eq!(eval[1], ACQUIRE.source.as_bytes());
        assert_eq!(
            &eval[2..],
            [&b"2"[..], b"lock", b"fence", b"v", b"10000", b"42"]
        );
    }
}
