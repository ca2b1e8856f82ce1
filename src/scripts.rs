//! The Lua scripts, and how they are sent.
//!
//! Acquiring is a plain `SET key value NX PX ttl` (no script: Lua would
//! cost the server about five times the CPU of the one command it wraps);
//! release and extend must compare before acting, atomically, so they are
//! scripts. Keys always travel in `KEYS[]` and values in `ARGV[]`; nothing is spliced
//! into script text, so the scripts are constants and their SHA1 is computed
//! once per process.
//!
//! Sending: `EVALSHA` first. A node that restarted has an empty script cache
//! and answers `NOSCRIPT`; we then send `EVAL` with the source, which runs the
//! script *and* caches it, so the reload costs one extra round trip on the
//! first call after a restart and nothing afterwards (redis-rs's `Script`
//! would send `SCRIPT LOAD` and then `EVALSHA`: two).

use std::sync::LazyLock;

use redis::Cmd;

/// A Lua script with its SHA1, computed once.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    fn new(source: &'static str) -> Self {
        let sha = redis::Script::new(source).get_hash().to_owned();
        Self { source, sha }
    }

    /// `EVALSHA sha 1 key args…`
    pub(crate) fn evalsha(&self, key: &str, args: &[&[u8]]) -> Cmd {
        self.build("EVALSHA", &self.sha, key, args)
    }

    /// `EVAL source 1 key args…`, the fallback after `NOSCRIPT`.
    pub(crate) fn eval(&self, key: &str, args: &[&[u8]]) -> Cmd {
        self.build("EVAL", self.source, key, args)
    }

    fn build(&self, verb: &str, body: &str, key: &str, args: &[&[u8]]) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body).arg(1).arg(key);
        for a in args {
            cmd.arg(*a);
        }
        cmd
    }
}

/// Delete the key only if it still holds our value. Returns 1 when deleted,
/// 0 when absent or owned by someone else.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#,
    )
});

/// Reset the expiry only if the key still holds our value. Returns 1 when
/// extended, 0 when absent or owned by someone else. Never deletes: an extend
/// that falls short leaves the lock to expire on its old schedule.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#,
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_put_keys_in_keys() {
        let cmd = RELEASE.evalsha("k", &[b"v"]);
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
            .eval("k", &[])
            .args_iter()
            .count()
            .to_string()
            .into_bytes();
        assert_eq!(eval, b"4");
    }
}
