//! One node's subscription connection, as `notify.rs` drives it: on a
//! plain node a RESP2 pub/sub connection (`SUBSCRIBE`); on a Redis Cluster
//! node redis-rs's cluster connection in RESP3, subscribed with
//! `SSUBSCRIBE` (sharded pub/sub, Redis 7) so that each notice travels only
//! within the shard of its lock key (the release script `SPUBLISH`es there)
//! rather than across the whole cluster bus. The cluster connection follows
//! the slot map and re-subscribes after a reconnect by itself.

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::cluster_async::ClusterConnection;
use redis::{PushKind, RedisResult, Value};
use tokio::sync::mpsc;

use crate::node::{Kind, Node};

pub(crate) enum Subscription {
    Plain(PubSubSink, PubSubStream),
    Cluster(ClusterConnection, mpsc::UnboundedReceiver<redis::PushInfo>),
}

impl Subscription {
    /// Connects; the caller bounds the wait.
    pub(crate) async fn connect(node: &Node) -> RedisResult<Subscription> {
        match node.kind() {
            Kind::Server(server) => {
                let pubsub = server.redis_client().get_async_pubsub().await?;
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
                Ok(Subscription::Cluster(connection, rx))
            }
        }
    }

    pub(crate) async fn subscribe(&mut self, channels: Vec<String>) -> RedisResult<()> {
        match self {
            Subscription::Plain(sink, _) => sink.subscribe(channels).await,
            Subscription::Cluster(connection, _) => {
                // One channel per command: channels of different keys hash
                // to different slots (and shards).
                for channel in channels {
                    connection.ssubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channels: Vec<String>) -> RedisResult<()> {
        match self {
            Subscription::Plain(sink, _) => sink.unsubscribe(channels).await,
            Subscription::Cluster(connection, _) => {
                for channel in channels {
                    connection.sunsubscribe(channel).await?;
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
            Subscription::Cluster(_, pushes) => loop {
                let push = pushes.recv().await?;
                if push.kind != PushKind::SMessage {
                    continue;
                }
                if let [Value::BulkString(channel), Value::BulkString(payload), ..] =
                    push.data.as_slice()
                {
                    return Some((
                        String::from_utf8_lossy(channel).into_owned(),
                        payload.clone(),
                    ));
                }
            },
        }
    }
}
