//! One plain-text question to a server that did not answer a TLS hello:
//! does it speak RESP? Used only on a `rediss://` connect that has been
//! silent for half its budget (see `node::handshake`).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// True when `host:port` answers an inline `PING` with a RESP reply (`+PONG`,
/// or an error such as `-NOAUTH`) within `within`: a plain-text Redis. A TLS
/// server answers such bytes with an alert or closes the connection; a
/// stalled one does not answer; both are false.
pub(crate) async fn answers_plain_resp(host: &str, port: u16, within: Duration) -> bool {
    let ask = async {
        let mut stream = TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0u8; 1];
        stream.read_exact(&mut first).await.ok()?;
        Some(matches!(first[0], b'+' | b'-'))
    };
    matches!(tokio::time::timeout(within, ask).await, Ok(Some(true)))
}
