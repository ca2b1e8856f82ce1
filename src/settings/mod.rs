//! The validated settings a client runs with (`config`, with the parsing of
//! node URLs into nodes-to-be) and the two policy values in them that a
//! request may override: [`AutoExtend`](autoextend::AutoExtend) and
//! [`Retry`](retry::Retry). Below `protocol`, whose shared state holds the
//! config; above `node`, whose connections the config describes.

pub(crate) mod autoextend;
pub(crate) mod config;
pub(crate) mod retry;
