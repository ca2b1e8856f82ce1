//! RESP2 replies, parsed by hand for the node connection of
//! `wire::pipelined`: the replies a lock's commands get back (integers,
//! bulk strings, short arrays) parsed straight into redis-rs's [`Value`],
//! without the generic combinator parser redis-rs drives per reply. Error
//! replies, rare, go through redis-rs's own parser, so that their kind
//! (`NOSCRIPT`, `NOPERM`, `READONLY`…) is exactly what redis-rs would have
//! made of them. Pure: tested without Redis.

use redis::Value;

/// Deeper arrays than this are refused as a protocol error: no reply of
/// ours nests more than three levels (`ROLE`'s replica list).
const MAX_DEPTH: usize = 16;

/// A longer bulk string is refused as a protocol error: it is Redis's own
/// ceiling for one (`proto-max-bulk-len`'s default), far above any reply
/// a lock's command gets, and without it a garbled length would keep the
/// reader buffering for bytes that never come.
const MAX_BULK: usize = 512 << 20;

/// A reply the stream does not parse as RESP2: the connection is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Garbled(pub(crate) String);

/// The first reply in `buf`, and how many bytes it took; `Ok(None)` when
/// `buf` holds only part of one.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, Garbled> {
    let mut at = 0;
    Ok(value(buf, &mut at, 0)?.map(|v| (v, at)))
}

/// The length of the status reply (`+…\r\n`) at the start of `buf`:
/// `None` when `buf` starts with anything else or with part of one.
pub(crate) fn status_len(buf: &[u8]) -> Option<usize> {
    if buf.first() != Some(&b'+') {
        return None;
    }
    let mut at = 1;
    line(buf, &mut at).map(|_| at)
}

/// The line starting at `*at` (without its CRLF), moving `*at` past it.
fn line<'b>(buf: &'b [u8], at: &mut usize) -> Option<&'b [u8]> {
    let rest = &buf[*at..];
    let cr = rest.iter().position(|&b| b == b'\r')?;
    if rest.len() < cr + 2 {
        return None;
    }
    *at += cr + 2;
    Some(&rest[..cr])
}

fn integer(text: &[u8]) -> Result<i64, Garbled> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(garbled("an integer", text));
    }
    // Up to 18 digits cannot overflow: no checked arithmetic (a fence has
    // 16, and every reply of a lock's cycle carries integers).
    if digits.len() <= 18 {
        let mut n: i64 = 0;
        for &d in digits {
            if !d.is_ascii_digit() {
                return Err(garbled("an integer", text));
            }
            n = n * 10 + i64::from(d - b'0');
        }
        return Ok(if negative { -n } else { n });
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(garbled("an integer", text));
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(i64::from(d - b'0')))
            .ok_or_else(|| garbled("an integer", text))?;
    }
    Ok(if negative { -n } else { n })
}

fn garbled(what: &str, text: &[u8]) -> Garbled {
    Garbled(format!(
        "expected {what}, got {:?}",
        String::from_utf8_lossy(&text[..text.len().min(64)])
    ))
}

fn value(buf: &[u8], at: &mut usize, depth: usize) -> Result<Option<Value>, Garbled> {
    let start = *at;
    let Some(&kind) = buf.get(start) else {
        return Ok(None);
    };
    *at += 1;
    let Some(text) = line(buf, at) else {
        return Ok(None);
    };
    Ok(Some(match kind {
        b'+' if text == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(
            std::str::from_utf8(text)
                .map_err(|_| garbled("a UTF-8 status", text))?
                .to_owned(),
        ),
        b':' => Value::Int(integer(text)?),
        b'-' => server_error(&buf[start..*at])?,
        b'$' => {
            let len = integer(text)?;
            if len < 0 {
                return Ok(Some(Value::Nil));
            }
            let len = usize::try_from(len)
                .ok()
                .filter(|&len| len <= MAX_BULK)
                .ok_or_else(|| garbled("a bulk length of at most 512 MiB", text))?;
            // Checked: on a 32-bit target an offset near the end of a large
            // buffer plus a length could wrap.
            let Some(end) = at
                .checked_add(len)
                .filter(|end| end.checked_add(2).is_some())
            else {
                return Err(garbled("a bulk length", text));
            };
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(garbled("CRLF after a bulk string", &buf[end..end + 2]));
            }
            let bytes = buf[*at..end].to_vec();
            *at = end + 2;
            Value::BulkString(bytes)
        }
        b'*' => {
            let len = integer(text)?;
            if len < 0 {
                return Ok(Some(Value::Nil));
            }
            if depth >= MAX_DEPTH {
                return Err(Garbled(format!("arrays nested deeper than {MAX_DEPTH}")));
            }
            let len = usize::try_from(len).map_err(|_| garbled("a length", text))?;
            // Each element takes at least 3 bytes: a length larger than
            // what could follow is no reason to reserve memory for it.
            let mut items = Vec::with_capacity(len.min(buf.len().saturating_sub(*at) / 3));
            for _ in 0..len {
                match value(buf, at, depth + 1)? {
                    Some(item) => items.push(item),
                    None => return Ok(None),
                }
            }
            Value::Array(items)
        }
        _ => return Err(garbled("a RESP2 reply", &buf[start..*at])),
    }))
}

/// An error reply, as redis-rs's parser makes it (its kind from its code).
fn server_error(line: &[u8]) -> Result<Value, Garbled> {
    match redis::parse_redis_value(line) {
        Ok(error @ Value::ServerError(_)) => Ok(error),
        _ => Err(garbled("an error reply", line)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{ErrorKind, ServerErrorKind};

    fn whole(bytes: &[u8]) -> Value {
        let (value, used) = parse(bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len(), "{bytes:?}");
        value
    }

    #[test]
    fn the_replies_of_the_lock_commands() {
        assert_eq!(whole(b"+OK\r\n"), Value::Okay);
        assert_eq!(
            whole(b"+PONG\r\n"),
            Value::SimpleString(String::from("PONG"))
        );
        assert_eq!(
            whole(b":1796538271629517\r\n"),
            Value::Int(1796538271629517)
        );
        assert_eq!(whole(b":-2\r\n"), Value::Int(-2));
        assert_eq!(whole(b"$-1\r\n"), Value::Nil);
        assert_eq!(whole(b"*-1\r\n"), Value::Nil);
        assert_eq!(whole(b"$0\r\n\r\n"), Value::BulkString(Vec::new()));
        assert_eq!(
            whole(b"$4\r\na\r\nb\r\n"),
            Value::BulkString(b"a\r\nb".to_vec())
        );
        assert_eq!(
            whole(b"*3\r\n:5\r\n*1\r\n$2\r\nok\r\n$-1\r\n"),
            Value::Array(vec![
                Value::Int(5),
                Value::Array(vec![Value::BulkString(b"ok".to_vec())]),
                Value::Nil
            ])
        );
        assert_eq!(whole(b"*0\r\n"), Value::Array(Vec::new()));
        // Both sides of the 18-digit fast path, and `i64`'s ends.
        for n in [
            999_999_999_999_999_999,
            1_000_000_000_000_000_000,
            -999_999_999_999_999_999,
            i64::MAX,
            i64::MIN + 1,
        ] {
            assert_eq!(whole(format!(":{n}\r\n").as_bytes()), Value::Int(n));
        }
    }

    #[test]
    fn a_status_is_measured_only_when_whole() {
        assert_eq!(status_len(b"+QUEUED\r\n:1\r\n"), Some(9));
        assert_eq!(status_len(b"+OK\r\n"), Some(5));
        for partial in [&b""[..], b"+", b"+QUEUED", b"+QUEUED\r"] {
            assert_eq!(status_len(partial), None, "{partial:?}");
        }
        for other in [&b"-ERR x\r\n"[..], b":1\r\n", b"*1\r\n+OK\r\n"] {
            assert_eq!(status_len(other), None, "{other:?}");
        }
    }

    #[test]
    fn every_cut_of_a_reply_is_partial_and_the_rest_stays() {
        let bytes = b"*2\r\n$5\r\nhello\r\n:42\r\n+OK\r\n";
        let first = bytes.len() - 5;
        for cut in 0..first {
            assert_eq!(parse(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
        let (value, used) = parse(bytes).unwrap().unwrap();
        assert_eq!(used, first);
        assert_eq!(
            value,
            Value::Array(vec![Value::BulkString(b"hello".to_vec()), Value::Int(42)])
        );
        assert_eq!(parse(&bytes[used..]), Ok(Some((Value::Okay, 5))));
    }

    #[test]
    fn error_replies_keep_the_kind_redis_rs_gives_them() {
        let kind = |bytes: &[u8]| match whole(bytes).extract_error() {
            Err(e) => (e.kind(), e.code().map(str::to_owned)),
            Ok(v) => panic!("not an error: {v:?}"),
        };
        assert_eq!(
            kind(b"-NOSCRIPT No matching script. Please use EVAL.\r\n"),
            (
                ErrorKind::Server(ServerErrorKind::NoScript),
                Some(String::from("NOSCRIPT"))
            )
        );
        assert_eq!(
            kind(b"-READONLY You can't write against a read only replica.\r\n").1,
            Some(String::from("READONLY"))
        );
        assert_eq!(
            kind(b"-WRONGPASS invalid username-password pair\r\n").1,
            Some(String::from("WRONGPASS"))
        );
        // Inside an array (a pipeline's reply), an error stays a value.
        let array = whole(b"*2\r\n-ERR no\r\n:1\r\n");
        assert!(matches!(&array, Value::Array(items) if matches!(items[0], Value::ServerError(_))));
    }

    #[test]
    fn garbage_is_refused_not_guessed() {
        for bytes in [
            &b"?\r\n"[..],
            b":12x\r\n",
            b":\r\n",
            b":99999999999999999999\r\n",
            b":9223372036854775808\r\n",
            b":1-2\r\n",
            b"$3\r\nabcde\r\n",
            b"$x\r\n",
            b"*1x\r\n",
        ] {
            assert!(parse(bytes).is_err(), "{bytes:?}");
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
        let fine = "*1\r\n".repeat(MAX_DEPTH) + ":1\r\n";
        assert!(parse(fine.as_bytes()).unwrap().is_some());
    }

    #[test]
    fn a_huge_announced_length_reserves_nothing_up_front() {
        assert_eq!(parse(b"*2147483647\r\n:1\r\n"), Ok(None));
        // Up to Redis's own ceiling a long bulk string is only incomplete;
        // past it (a garbled length) the stream is refused at once instead
        // of buffered for bytes that never come.
        assert_eq!(parse(b"$536870912\r\nab"), Ok(None));
        for bytes in [&b"$536870913\r\nab"[..], b"$9223372036854775807\r\n"] {
            assert!(parse(bytes).is_err(), "{bytes:?}");
        }
    }
}
