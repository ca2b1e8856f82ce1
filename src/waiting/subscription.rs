//! One node's subscription connection, as `notify/subscriber.rs` drives
//! it: on a plain node a RESP2 pub/sub connection (`SUBSCRIBE`); on a Redis
//! Cluster node redis-rs's cluster connection in RESP3, subscribed with
//! `SSUBSCRIBE` (sharded pub/sub, Redis 7) so that each notice travels only
//! within the shard of its lock key (the release script `SPUBLISH`es there)
//! rather than across the whole cluster bus. The cluster connection follows
//! the slot map and re-subscribes after a reconnect by itself; a shard
//! channel the server drops because its slot moved to another master (a
//! `sunsubscribe` nobody asked for) is subscribed again here, at its new
//! owner.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::cluster_async::ClusterConnection;
use redis::{PushKind, RedisResult, Value};
use tokio::sync::mpsc;

use crate::node::{Kind, Node};

pub(crate) enum Subscription {
    Plain(PubSubSink, PubSubStream),
    Cluster(Sharded),
}

pub(crate) struct Sharded {
    connection: ClusterConnection,
    pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    /// The channels subscribed, to tell a channel the server dropped from
    /// one we unsubscribed.
    wanted: HashSet<String>,
    /// Bounds a re-subscription.
    timeout: Duration,
}

impl Subscription {
    /// Connects; the caller bounds the wait.
    pub(crate) async fn connect(node: &Node) -> RedisResult<Subscription> {
        match node.kind() {
            Kind::Server(server) => {
                // A Sentinel node's notices come from the master the
                // Sentinels name now.
                let client = match server.sentinel() {
                    Some(sentinel) => {
                        sentinel
                            .locate(server.connect_timeout())
                            .await
                            .map_err(|e| {
                                redis::RedisError::from(std::io::Error::other(e.to_string()))
                            })?
                            .client
                    }
                    None => server.redis_client(),
                };
                let pubsub = client.get_async_pubsub().await?;
                let (sink, stream) = pubsub.split();
                Ok(Subscription::Plain(sink, stream))
            }
            Kind::Cluster(cluster) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let timeout = cluster.timeouts().connect;
                #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
                let mut builder =
                    redis::cluster::ClusterClientBuilder::new(cluster.seeds().to_vec())
                        .use_protocol(redis::ProtocolVersion::RESP3)
                        .push_sender(tx)
                        .connection_timeout(timeout)
                        .response_timeout(timeout);
                #[cfg(feature = "tls")]
                if let Some(tls) = cluster.tls() {
                    builder = builder.certs(tls.certificates()?);
                }
                let connection = builder.build()?.get_async_connection().await?;
                Ok(Subscription::Cluster(Sharded {
                    connection,
                    pushes: rx,
                    wanted: HashSet::new(),
                    timeout,
                }))
            }
        }
    }

    pub(crate) async fn subscribe(&mut self, channels: Vec<String>) -> RedisResult<()> {
        match self {
            Subscription::Plain(sink, _) => sink.subscribe(channels).await,
            Subscription::Cluster(sharded) => {
                // One channel per command: channels of different keys hash
                // to different slots (and shards).
                for channel in channels {
                    sharded.connection.ssubscribe(&channel).await?;
                    sharded.wanted.insert(channel);
                }
                Ok(())
            }
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channels: Vec<String>) -> RedisResult<()> {
        match self {
            Subscription::Plain(sink, _) => sink.unsubscribe(channels).await,
            Subscription::Cluster(sharded) => {
                for channel in channels {
                    sharded.wanted.remove(&channel);
                    sharded.connection.sunsubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }

    /// The next message's channel and payload; `None` when the connection
    /// is gone.
    pub(crate) async fn next(&mut self) -> Option<(String, Vec<u8>)> {
        match self {
            Subscription::Plain(_, stream) => {
                let message = stream.next().await?;
                Some((
                    message.get_channel_name().to_owned(),
                    message.get_payload_bytes().to_vec(),
                ))
            }
            Subscription::Cluster(sharded) => loop {
                let push = sharded.pushes.recv().await?;
                let channel = match push.data.first() {
                    Some(Value::BulkString(channel)) => String::from_utf8_lossy(channel),
                    _ => continue,
                };
                match push.kind {
                    PushKind::SMessage => {
                        if let Some(Value::BulkString(payload)) = push.data.get(1) {
                            return Some((channel.into_owned(), payload.clone()));
                        }
                    }
                    // The slot moved: subscribe again, at its new master. A
                    // failure leaves the waiters their timers.
                    PushKind::SUnsubscribe if sharded.wanted.contains(channel.as_ref()) => {
                        let again = sharded.connection.ssubscribe(channel.as_ref());
                        if !matches!(
                            tokio::time::timeout(sharded.timeout, again).await,
                            Ok(Ok(()))
                        ) {
                            tracing::debug!(%channel, "re-subscribing a moved shard channel failed");
                        }
                    }
                    _ => {}
                }
            },
        }
    }
}
