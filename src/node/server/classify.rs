//! What a failed request or connect means for the node: the redis-rs
//! error sorted into the node error kinds the protocol decides on.

use std::sync::Arc;

use redis::RedisError;

use crate::error::failure::NodeErrorKind;
use crate::node::tls;
use crate::wire::info;

/// `command`: what was sent, named in a permission error about its keys or
/// channels.
pub(crate) fn classify(e: RedisError, command: &str) -> NodeErrorKind {
    // With TLS 1.3 a server checks the client's certificate after the
    // client's side of the handshake is done: a refused certificate shows
    // up on the first command, as an alert.
    if let Some(reason) = tls::handshake_error(&e) {
        NodeErrorKind::Tls { reason }
    } else if let Some(denied) = info::permission_denied(&e, command) {
        NodeErrorKind::NoPermission {
            denied,
            source: Arc::new(e),
        }
    } else if info::is_auth_error(&e) {
        NodeErrorKind::Auth(Arc::new(e))
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        NodeErrorKind::Connect(Arc::new(e))
    } else {
        NodeErrorKind::Redis(Arc::new(e))
    }
}
