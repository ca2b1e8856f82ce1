//! The audit's I/O: a fresh connection to one node, the questions asked
//! over it, and the clock samples, all within the node's connect timeout.
//! It records raw answers in an [`Observed`] and judges nothing.
//!
//! A fresh connection, never the lock connection: the lock connection's
//! handshake would refuse a replica before we could describe it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, RedisError, Value};

use super::report::{ClockSample, Observed};
use crate::wire::info;

/// `TIME` round trips per node. Three make a change of offset visible and
/// give the minimum-round-trip sample (the most accurate one) some choice.
const CLOCK_SAMPLES: usize = 3;

/// Visits one server within `timeout` and records whatever it answered
/// before the visit ended.
pub(crate) async fn observe(
    client: &redis::Client,
    timeout: Duration,
    in_cluster: bool,
) -> Observed {
    let mut seen = Observed {
        in_cluster,
        ..Observed::default()
    };
    let outcome = tokio::time::timeout(timeout, probe(client, timeout, &mut seen)).await;
    // The probe's future (and its borrow of `seen`) is gone here, finished
    // or dropped at the deadline; what it recorded so far stays. The
    // driver's connect timeout equals ours and may fire first: either way
    // the node did not answer in time.
    let failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) if !e.is_timeout() => {
            // The lock connection's test (`node::classify`), so the audit
            // calls a refusal what the client would.
            seen.auth_refused = info::is_auth_error(&e);
            Some(describe(&e))
        }
        Ok(Err(_)) | Err(_) => Some(format!(
            "no answer within the connect timeout ({timeout:?})"
        )),
    };
    seen.failure = failure;
    seen
}

async fn probe(
    client: &redis::Client,
    timeout: Duration,
    seen: &mut Observed,
) -> redis::RedisResult<()> {
    let started = Instant::now();
    // The outer deadline bounds everything; the driver's own response
    // timeout would only race it.
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None);
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    // One round trip: the commands are queued together on the multiplexed
    // connection, but each keeps its own reply, so a refused `CONFIG`
    // (renamed, or an ACL without it) does not hide the `INFO` answer.
    let (role, info, policy, appendonly, appendfsync, save, min_replicas) = tokio::join!(
        query_raw(&conn, redis::cmd("ROLE")),
        query_raw(&conn, redis::cmd("INFO")),
        config_get(&conn, "maxmemory-policy"),
        config_get(&conn, "appendonly"),
        config_get(&conn, "appendfsync"),
        config_get(&conn, "save"),
        config_get(&conn, "min-replicas-to-write"),
    );
    seen.first_reply = Some(started.elapsed());
    // Without a password in the URL nothing is sent at connect, and a
    // server that requires one says so here (NOAUTH).
    if let (Err(e), Err(_)) = (&role, &info) {
        seen.auth_refused = info::is_auth_error(e);
    }
    seen.role = Some(role.map_err(|e| describe(&e)));
    seen.info = Some(
        info.map_err(|e| describe(&e))
            .and_then(|v| info::text(&v).ok_or_else(|| unexpected("INFO", &v))),
    );
    seen.policy = Some(policy);
    seen.appendonly = Some(appendonly);
    seen.appendfsync = Some(appendfsync);
    seen.save = Some(save);
    seen.min_replicas = Some(min_replicas);

    // Sequential, so each round trip is measured alone.
    for _ in 0..CLOCK_SAMPLES {
        // The wall clock, not the monotonic one: the point is to compare
        // wall clocks. Lock logic never does this.
        let sent_wall = SystemTime::now();
        let sent = Instant::now();
        let reply = query(&conn, redis::cmd("TIME")).await;
        let rtt = sent.elapsed();
        match reply.and_then(|v| info::parse_time(&v).ok_or_else(|| unexpected("TIME", &v))) {
            Ok(node_us) => seen.samples.push(ClockSample {
                node_us,
                sent_us: unix_micros(sent_wall),
                rtt,
            }),
            Err(e) => {
                seen.time_error = Some(e);
                break;
            }
        }
    }
    Ok(())
}

/// Runs `cmd`; a server's error reply becomes its text. A broken connection
/// does too: the later steps then fail the same way and the deadline bounds
/// the rest.
async fn query(conn: &MultiplexedConnection, cmd: Cmd) -> Result<Value, String> {
    query_raw(conn, cmd).await.map_err(|e| describe(&e))
}

async fn query_raw(conn: &MultiplexedConnection, cmd: Cmd) -> redis::RedisResult<Value> {
    let mut conn = conn.clone();
    cmd.query_async::<Value>(&mut conn).await
}

fn describe(e: &RedisError) -> String {
    e.to_string().trim().to_owned()
}

async fn config_get(conn: &MultiplexedConnection, name: &str) -> Result<Option<String>, String> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(name);
    let reply = query(conn, cmd).await?;
    info::parse_config_get(&reply, name).ok_or_else(|| unexpected("CONFIG GET", &reply))
}

fn unexpected(command: &str, reply: &Value) -> String {
    let mut shown = format!("{reply:?}");
    if shown.len() > 80 {
        let mut end = 80;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push('…');
    }
    format!("unexpected reply to {command}: {shown}")
}

fn unix_micros(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_micros()).unwrap_or(i128::MAX),
        Err(before) => -i128::try_from(before.duration().as_micros()).unwrap_or(i128::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unexpected_replies_are_shown_short() {
        assert!(unexpected("X", &Value::BulkString(vec![0xff; 500])).len() < 200);
    }

    /// The report can cross threads, and so can the audit itself (for a
    /// health check spawned on a multi-threaded runtime): the probe's
    /// future is what would make it `!Send`.
    #[test]
    fn send_and_sync() {
        fn shared<T: Send + Sync + 'static>() {}
        shared::<crate::audit::report::Audit>();
        fn sendable<T: Send>(_: &T) {}
        let client = crate::Client::new(["redis://127.0.0.1:1"]).unwrap();
        // Built, never polled: nothing connects.
        let audit = client.audit();
        sendable(&audit);
    }
}
